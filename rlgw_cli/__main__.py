"""`python -m rlgw_cli ...`: the same as the `rlgw` console script."""

from .main import main

main()
