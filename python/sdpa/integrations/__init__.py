"""Integrations with other libraries, each imported on demand (none is a dependency).

Planned: ``sdpa.integrations.transformers.register()``, registering an attention function
with transformers' AttentionInterface (attn_implementation="sdpa_cpp"). An integration is
a module here that imports its library lazily and calls the public ``sdpa`` API (or
``sdpa.torch`` for autograd-aware torch calls).
"""
