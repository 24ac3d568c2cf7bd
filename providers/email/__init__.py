"""Email providers: SMTP (`providers.email.smtp:SmtpProvider`) and Resend
(`providers.email.resend:ResendProvider`); `mime` holds what they share."""
