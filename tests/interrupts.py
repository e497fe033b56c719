"""A real SIGINT sent to a child interpreter in a long call: the protocol
the Ctrl-C tests share (host and device)."""
import signal
import subprocess
import sys
import tempfile
import textwrap
import time


def assert_ctrl_c_stops(code, wait=1.0, within=2.0, timeout=120):
    """Run ``code`` in a child that prints a line starting "ready" before
    its long call, "interrupted ..." when KeyboardInterrupt stops it, then
    "again True" when a call afterwards gives its earlier result; send
    SIGINT ``wait`` seconds after "ready" and check all three, the stop
    within ``within`` seconds."""
    # SIGINT at its default in the child: a test run started in the
    # background of a shell without job control inherits it ignored, and
    # Python then installs no KeyboardInterrupt handler
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=tempfile.gettempdir(),
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = child.stdout.readline().strip()
    assert first.startswith("ready"), first + child.communicate(timeout=timeout)[0]
    time.sleep(wait)
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    line = child.stdout.readline().strip()
    stopped = time.monotonic() - sent
    rest = child.communicate(timeout=timeout)[0]
    assert line.startswith("interrupted"), first + " / " + line + rest
    assert stopped < within, stopped
    assert "again True" in rest
