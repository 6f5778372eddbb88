"""Every input of a spec the coordinator reads, read now: what `submit` checks before it queues
a job, and `run` (and each job of `serve`) before anything starts.

A job that a `serve` cannot read must be refused when it is submitted, not kill the `serve`
that takes it (and every one after). So everything a job's run reads on the coordinator is
read here, through the capped, regular-file-only reader (``devices.files``) with its depth
limits: the model folder (every file regular, config.json, the weights' index), its tokenizer
(tokenizer.json, tokenizer_config.json) and its chat template, compiled and rendered once in
its bounded child (``harness.workloads.chat_template``). Gbm's predictor files (at most 64 MiB)
and the workloads' text files are read with the spec already. Each problem is an InputError
naming the file (exit 2).
"""

from __future__ import annotations

from harness.identity import check_model_folder
from harness.spec import Spec
from harness.workloads.kinds import KINDS
from harness.workloads.tokenizer import load_tokenizer


def check_inputs(spec: Spec) -> None:
    """Read the spec's model folder, tokenizer and chat template as its runs would; InputError
    naming the first problem."""
    if spec.model is None:
        return
    check_model_folder(spec.model)
    if any(KINDS[workload.kind].uses_model for workload in spec.workloads):
        tokenizer = load_tokenizer(spec.model)
        tokenizer.render_chat([{"role": "user", "content": "benchfarm"}])
