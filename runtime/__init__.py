"""Shared runtime of every turnmesh process: errors, serving, logging, ids."""
