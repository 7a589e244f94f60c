"""Launch rendering: Miles' argv and env per target (`miles`), its flow and train-only step as steps. It
starts no process: `rlsmoke.processes` runs what is rendered here."""
