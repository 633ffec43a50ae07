"""One OpenAI-compatible endpoint in front of every deployment sm120 runs, routing by the
request's `model`, and swapping deployments on demand when they cannot all be up."""
