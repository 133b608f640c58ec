"""Structured outputs and tool calls: JSON schemas, grammars for constrained decoding, tool definitions."""
