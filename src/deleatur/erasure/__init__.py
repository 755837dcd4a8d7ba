"""Erasure by subject or account (Art. 17): plan, execute, certify, verify."""
