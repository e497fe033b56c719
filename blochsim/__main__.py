"""``python -m blochsim``: simulate the reference MRF dictionary."""
from blochsim.cli import main

raise SystemExit(main())
