"""Principals, their capabilities and scopes, and the authorization and audit of every call."""
