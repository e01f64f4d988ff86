"""controller/inputs"""
