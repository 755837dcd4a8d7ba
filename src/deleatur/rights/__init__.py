"""Data-subject rights beyond erasure: restriction (Art. 18), and later export (Art. 15/20)."""
