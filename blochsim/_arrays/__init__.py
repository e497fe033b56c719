"""Arrays at the edge of the package: the checks of user input and their
units (validate), device arrays and their plumbing (device), and noise
added in place on the host or the device (noise)."""
