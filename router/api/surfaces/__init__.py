"""The API surfaces beyond chat completions: OpenAI's Responses API and Anthropic's Messages API,
each a parser into its chat twin (`*_protocol`) and a renderer of the chat form (`*_shape`)."""
