"""controller/passes"""
