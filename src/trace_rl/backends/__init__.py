"""Policy backends behind one token-in/token-out protocol (base.py): Hugging Face (hf.py), vLLM's async engine
(vllm.py, optional extra), an OpenAI-compatible /v1/completions server (openai_server.py), scripted for tests."""
