"""The code the agent fixes: a greeting that lost its exclamation mark."""


def greet(name: str) -> str:
    return f"Hello, {name}."
