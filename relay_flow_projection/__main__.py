"""``python -m relay_flow_projection``: the operator command line."""

from relay_flow_projection.cli import main

if __name__ == "__main__":
    main()
