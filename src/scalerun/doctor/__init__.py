"""``scalerun doctor``: check a job's placement, binding, network and collectives on every rank.

The pieces, in the order data flows: :mod:`.facts` (what each rank knows about itself),
:mod:`.checks` (pure cross-rank checks -> PASS/WARN/FAIL verdicts with fixes),
:mod:`.collectives` (barrier with timeout, all-reduce sums, nccl-tests-style bandwidth
sweep, node-set probes), :mod:`.bisect` (pure search for bad nodes), :mod:`.report` (tables,
verdict list, JSON) and :mod:`.rank` (the entry point each rank runs). Importing this package
imports no torch and probes nothing.
"""
