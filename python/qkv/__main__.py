"""python3 -m qkv: the qkv tool's `example` and `devices` from Python.

    python3 -m qkv example [--backend vulkan|cpu] [--scaled]   the tutorial's walkthrough, as `qkv example`
    python3 -m qkv devices                                     the Vulkan devices

Exit status as the qkv tool's: 0 success, 2 bad usage or input, 1 a failure at run time.
"""

import argparse
import sys

from . import _qkv, devices
from ._errors import InvalidArgument, NoMatchingDevice, NumericOverflow


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m qkv", description="qkv from Python: the tool's example and devices.")
    commands = parser.add_subparsers(dest="command", required=True)
    example = commands.add_parser("example", help="Walk through the tutorial's worked example step by step, "
                                  "computed now and checked against the compile-time values")
    example.add_argument("--backend", choices=("vulkan", "cpu"), default="vulkan",
                         help="where to compute the attention weights and outputs: vulkan (the default device, or "
                              "QKV_DEVICE) or cpu (the float64 reference backend)")
    example.add_argument("--scaled", action="store_true", help="scale the scores by 1/sqrt(3) instead of 1")
    commands.add_parser("devices", help="the Vulkan devices of this machine")
    args = parser.parse_args(argv)
    try:
        if args.command == "devices":
            found = devices()
            for d in found:
                print(f"{d.index}: {d.name} ({d.type}, Vulkan {d.api_version}, driver {d.driver})")
            if not found:
                print("no Vulkan device (device=\"cpu\" still works)")
            return 0
        text, checks, disagreements = _qkv._example(args.backend, args.scaled)
        sys.stdout.write(text)
        sys.stdout.flush()
        if disagreements:
            print(f"qkv: {disagreements} of {checks} matrices differ from the compile-time values (marked \u2717 above)",
                  file=sys.stderr)
            return 1
        return 0
    except (InvalidArgument, NoMatchingDevice, NumericOverflow) as e:
        print(f"qkv: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # every other failure is a run-time one, reported in one line
        print(f"qkv: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
