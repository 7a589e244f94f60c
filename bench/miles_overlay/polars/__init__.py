"""Import-only stand-in for polars: Miles' dashboard store (miles/dashboard/store.py) imports it at its
top and reads dtypes; the dashboard does not run in the train-only step, and its launch drops
`--dump-details`, the only path that writes polars frames."""

from rlsmoke_standin import standin_package

standin_package(__name__)
