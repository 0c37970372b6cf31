"""Attention backends behind one interface (`base.py`), all sharing one paged KV layout."""
