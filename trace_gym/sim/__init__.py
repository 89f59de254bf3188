"""trace_gym/sim"""
