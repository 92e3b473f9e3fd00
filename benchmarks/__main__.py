"""``python -m ort_mx_ops.benchmarks``: the benchmark command line (see cli.py)."""
import sys

from ort_mx_ops.benchmarks.cli import main

sys.exit(main())
