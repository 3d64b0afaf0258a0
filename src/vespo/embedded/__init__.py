"""The embedded default: a tiny local model, synthetic tasks graded by the math reward (`task`), and the cached SFT
warm start that makes the model a partial solver (`warm_start`). No Hub access needed."""
