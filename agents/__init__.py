"""Policies for the trace-gym envs (installed as ``trace_gym.agents``).

- `formats`: ReAct formats per env id (system prompts, stop strings, tools);
- `context`: the token contract shared by token-level backends;
- `hf.HFPolicy`, `vllm_backend.VLLMPolicy`, `openai_backend.OpenAIPolicy`: backends;
- `scripted.make_scripted` / `SCRIPTED`: noisy-oracle policies for every env;
- `tiny`: tiny local Qwen3 models with a trained tokenizer and an SFT warm start;
- `evaluate` / `rollout`: ``trace-gym eval`` and ``trace-gym rollout``.

Nothing heavy is imported here; import the submodule you need. See docs/agents.md.
"""
