"""envs/math"""
