"""envs/bfcl"""
