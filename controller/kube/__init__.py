"""controller/kube"""
