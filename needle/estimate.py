"""``python -m needle.estimate``: the memory estimator's command line (``needle.memory``)."""
from needle.memory.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
