"""Reading the custom calls out of a lowered program: benchmarks/hlo_inspect.py, which the benchmarks use too."""

import benchmarks_package

custom_calls = benchmarks_package.load().hlo_inspect.custom_calls
