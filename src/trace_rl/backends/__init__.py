"""Policy backends behind one token-in/token-out protocol (base.py): Hugging Face (hf.py), scripted for tests."""
