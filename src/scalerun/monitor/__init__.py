"""Node monitoring: one sampler per node writes ``RUN_DIR/monitor/<node>.jsonl``.

This package decides what a node sampler records (GPU utilisation, memory, power and cap,
temperature and clocks; node and per-rank CPU and memory), which vendor interface it
reads them through (NVML > nvidia-smi > amdsmi > amd-smi > rocm-smi > none, see
:mod:`.select`), how multi-die modules' power is attributed (:mod:`.modules`) and how the
sampler is started beside local rank 0 and stopped with the job (:mod:`.node`).

Importing it imports nothing heavy, probes no hardware and starts nothing: the vendor
libraries (``pynvml``, ``amdsmi``) are imported only by the backend that uses them.

Modules: :mod:`.records` (the line format), :mod:`.backend` (the backend contract and
tool runner), :mod:`.nvidia`, :mod:`.amd`, :mod:`.rocm_smi` (vendors), :mod:`.host`
(psutil), :mod:`.select`, :mod:`.sampler`, :mod:`.node` (process entry point).
"""

from __future__ import annotations
