"""controller/observe"""
