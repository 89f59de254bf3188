"""envs/hotpotqa"""
