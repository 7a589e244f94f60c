"""Only `mooncake.engine`, which Miles' p2p weight transfer imports at its top: no `mooncake.store`, so
Miles' object-store choice still sees no Mooncake."""
