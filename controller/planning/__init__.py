"""controller/planning"""
