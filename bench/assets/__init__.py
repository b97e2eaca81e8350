"""The embedded tiny-math model (weights, tokenizer, config) that ships with bench."""
