"""Reproduce the papers' tables and sweep figures: plans, paper values as data, table and figure builders."""
