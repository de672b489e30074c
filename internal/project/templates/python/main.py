"""__NAME__: a small Python program.

Run it from the workspace with `python3 __NAME__/main.py`, or from inside
the directory with `python3 main.py`; test it with `python3 -m unittest -v`.
"""


def greet(name: str) -> str:
    """Return a greeting for name."""
    return f"Hello, {name}!"


def main() -> None:
    print(greet("__NAME__"))


if __name__ == "__main__":
    main()
