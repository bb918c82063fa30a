"""Model loading: folders, GGUF files (reader, tokenizer, converter), Hugging Face ids and the demo model."""
