"""The llama.cpp backend (`backend`: the Backend a tier uses) and its engine, in parts: one thread owns
the model and decodes many sequences per step.

`engine` holds the thread, the queue and the decode loop (`LlamaEngine`); what each step does for
one sequence lives beside it, one concern a module, as parts `LlamaEngine` inherits: `sampling`
(distributions, logit_bias and penalties, logprobs), `grammar` (GBNF constraints), `tokens`
(taking a chosen token, stop strings, events), `drafting` (speculative decoding), `spec_cascade`
(the research cascade rule), `scoring` (reading another tier's answer). `jobs` holds what callers
submit and hear back, `prefix_cache` the prompt KV kept between requests, `vocab` the vocabulary
signatures that say whether two models can draft for each other, `native` what touches llama.cpp's
process-wide state. The parts are methods, not objects the loop calls through: per-token work
costs what it did when this was one file.
"""
