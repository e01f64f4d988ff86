"""controller/cli"""
