"""`sm120 compose A B`: several recipes and the gateway in front of them as one compose
project, with the keys it needs written beside it."""
