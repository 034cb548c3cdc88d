"""``moegen-yosys``: Yosys 0.70 run natively (the ``pyosys`` wheel's libyosys and yosys-abc), with
the options of the ``yosys`` command line the synthesis flow uses: ``-p SCRIPT``, ``-l LOG`` (the
log to that file, else to standard output), ``-q`` (no log on standard output) and ``-V``.

Why not YoWASP's Yosys, the same release: WebAssembly has 32-bit addresses, so YoWASP's Yosys
stops (exit status 1, no message) when its memory reaches 4 GiB, and the layer's compute-bound
demo configuration needs more in the gate-level techmap (`make sweep`). Natively the same
script runs without that ceiling and faster; the netlists are the same
(``tests/test_flows.py::test_native_yosys_maps_as_yowasp_does``). pyosys ships no command-line
``yosys``, only the library, hence this launcher (written by hand for that reason alone).
"""

import argparse
import os
import sys

__all__ = ["main"]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="moegen-yosys", description=__doc__.split("\n")[0])
    parser.add_argument("-q", dest="quiet", action="store_true",
                        help="no log on standard output")
    parser.add_argument("-l", dest="log", help="write the log to this file")
    parser.add_argument("-p", dest="script", help="the commands to run")
    parser.add_argument("-V", dest="version", action="store_true", help="print the version")
    args = parser.parse_args(argv)
    from pyosys import libyosys
    if args.version:
        print(libyosys.yosys_maybe_version())
        return 0
    if args.script is None:
        parser.error("-p SCRIPT is required")
    # libyosys logs to standard output, and an error's "ERROR: ..." line to standard error
    # when that is not a terminal (then exits with status 1, as the yosys command does): with
    # -l both go to the log file, so that a failure's reason is in the log as with yosys -l.
    sys.stdout.flush()
    sys.stderr.flush()
    if args.log or args.quiet:
        log = os.open(args.log or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        if args.log:
            os.dup2(log, 2)
        os.close(log)
    libyosys.run_pass(args.script, libyosys.Design())
    libyosys.log_flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
