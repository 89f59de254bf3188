"""trace_gym/alloc"""
