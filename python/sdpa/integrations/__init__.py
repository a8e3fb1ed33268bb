"""Integrations with other libraries, each imported on demand (none is a dependency).

- ``sdpa.integrations.transformers``: ``register()`` adds ``attn_implementation="sdpa_cpp"``
  to Hugging Face transformers (every attention layer of a model through sdpa);
  ``register("sdpa")`` also serves continuous batching (``generate_batch``).

An integration is a module here that imports its library lazily and calls the public
``sdpa`` API (or ``sdpa.torch`` for autograd-aware torch calls).
"""
