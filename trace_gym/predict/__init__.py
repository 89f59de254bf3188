"""trace_gym/predict"""
