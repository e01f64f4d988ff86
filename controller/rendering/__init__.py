"""controller/rendering"""
