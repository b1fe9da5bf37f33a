"""Development scripts: the benchmarks (:mod:`scripts.bench`) and the shell helpers beside them."""
