from greeting import greet


def test_greet_is_enthusiastic():
    assert greet("Ada") == "Hello, Ada!"
