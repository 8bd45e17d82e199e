"""The ``llm`` backend: a Hugging Face causal LM run one continuous-batching step at a time.

Loaded once from a local directory (config.json, model.safetensors, tokenizer files): never
downloaded, safetensors only. Four jobs, one module each: the tokenizer (:mod:`.tokenizer`), the
per-sequence and batched KV caches (:mod:`.kv_cache`), which rows run together in a forward
(:mod:`.row_groups`), and picking the next token (:mod:`.sampling`); :mod:`.runner` runs a step
through them, and :mod:`.lean_forward` is the fused forward pass of plain Llama models.

Called from one worker thread only (the engine's); never sees queues, HTTP or asyncio.
"""
