"""Root conftest: the rlsmoke plugin is loaded through its pytest11 entry point, not from here.

Keeping this file empty of fixtures means an installed rlsmoke behaves the same in a user's repo.
"""
