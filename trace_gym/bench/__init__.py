"""trace_gym/bench"""
