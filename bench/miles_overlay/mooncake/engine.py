"""Import-only stand-in: the p2p weight push to SGLang (its only user) does not run in train-only."""

from rlsmoke_standin import StandIn

TransferEngine = StandIn("mooncake.engine.TransferEngine")
