"""dapo_core: the DAPO algorithm (arXiv 2503.14476) as pure functions over tensors and scalars.

Modules (import the one you need; this package imports nothing eagerly, so ``import dapo_core``
stays cheap and never pulls math-verify):

* ``advantages`` - group-relative advantages (eq. 9), GRPO and Dr.GRPO variants.
* ``losses``     - the clip-higher policy loss (sec. 3.1, eq. 10) with token-level,
  GRPO and Dr.GRPO aggregations (sec. 3.3, eq. 12).
* ``overlong``   - soft overlong punishment (eq. 13) and overlong filtering (sec. 3.4).
* ``sampling``   - dynamic sampling: group filter reasons and the round accumulator (sec. 3.2).
* ``metrics``    - entropy, length, truncation, accuracy and zero-std-group metrics.
* ``rewards``    - rule-based reward with math-verify (eq. 7).

Other modules here (answer handling, evaluation metrics) document themselves.

Only torch, numpy and the standard library are imported here (math-verify in ``rewards``);
never flyte, vllm, deepspeed, ray or file I/O.
"""
