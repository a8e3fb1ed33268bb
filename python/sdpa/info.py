"""``python -m sdpa.info``: what ``sdpa info`` prints (version, CPU capability, OpenMP
threads and every backend's state)."""

from ._C import info as text


def main() -> None:
    print(text(), end="")


if __name__ == "__main__":
    main()
