"""Shared data structures for drafters (n-gram tables, tries, caches, tree builders), built once."""
