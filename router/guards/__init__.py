"""Guards: request stages that find personal data, secrets and prompt injection in a request or
its answer, and act on what they find (block, redact, keep it on the machine, or log only).

`findings` is what a detector returns (a kind and a place, never kept beyond the request);
`normalise` is the view detectors read (invisible characters dropped, look-alike letters folded,
base64 opened); the detectors are `pii` (Microsoft Presidio's pattern recognizers), `secrets` and
`injection` (small pattern sets of our own); `texts` reads and rewrites every place of a request
that is sent to a tier; `redaction` makes and restores placeholders; `stage` is the guard itself,
one stage per detector, registered by `router.pipeline.builtin`. The policy in prose:
docs/guardrails.md.
"""
